"""moescope storage (see DESIGN.md; filled in by its issue)."""
