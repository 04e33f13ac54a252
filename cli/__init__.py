"""The `moescope` command line and its load generator."""
