"""Graded assignments: student-facing checks, and a batch grader whose verdicts are computed outside the student's kernel."""
