"""Why was it slow: explanations computed in the cold path from the recorded timelines and engine steps."""
