"""Wrong and alternative-correct solutions to every graded assignment, and an in-process grader to score them.

Kept under tests/ (never in the dsgd_teach package): the package is visible inside the grading sandbox, and the
correct alternatives here are solutions.
"""
