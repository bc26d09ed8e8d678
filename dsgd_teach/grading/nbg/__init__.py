"""The nbgrader route: nbgrader's autograde, feedback and gradebook with dsgd-teach's verdicts (see README.md)."""
