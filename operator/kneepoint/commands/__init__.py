"""CLI commands that sit on the pure core (estimate, decide, report, export)."""
