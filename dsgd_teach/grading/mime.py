"""The MIME type of a check() report: the one kind of output the grading worker keeps from a kernel."""

MIME = "application/vnd.dsgd-teach.check+json"
