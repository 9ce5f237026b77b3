"""The console scripts, one module each: argument parsing and the call into the layers below."""
