"""Statistics over the tidy metrics table: ranks, hypothesis tests, bootstrap."""
