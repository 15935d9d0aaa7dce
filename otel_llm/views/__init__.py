"""Ways to look at the telemetry: the timeline report (HTML, Chrome trace) and the Grafana dashboard."""
