"""Why was it slow: engine-step anatomy, the roofline of each step, GPU telemetry, and the slow-cause
verdict: explanations computed in the cold path from the recorded timelines and engine steps."""
