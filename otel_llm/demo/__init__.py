"""The demo's scripted workload, the tiny model it serves and what it prints (examples/demo.py)."""
