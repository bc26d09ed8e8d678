# nbgrader configuration for the dsgd-teach assignments (run nbgrader from course/assignments/, or copy this file
# into your course directory). See course/assignments/README.md.
#
# Grading goes through dsgd-teach's verdict: nbgrader's Execute step is replaced by DsgdGrade, which runs every
# notebook in a fenced grading kernel and compares the reported values outside it, so redefining or patching
# `check` earns nothing. The preprocessors are named by string on purpose: if the grading environment cannot
# import dsgd_teach, every `nbgrader autograde` fails loudly (exit 1, "No module named 'dsgd_teach'") instead of
# silently falling back to nbgrader's own execution.
# Keep the sources (with solutions and hidden tests) in a private fork; release/ is what students get.
c = get_config()  # noqa: F821 - provided by nbgrader when it loads this file

c.CourseDirectory.root = "."
c.CourseDirectory.source_directory = "source"
c.CourseDirectory.release_directory = "../../release"
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearHiddenTests.begin_test_delimeter = "BEGIN HIDDEN TESTS"
c.ClearHiddenTests.end_test_delimeter = "END HIDDEN TESTS"

_ROUTE = "dsgd_teach.grading.nbg.preprocessors."
# Every submission is read bounded, in a memory-capped child, and nbgrader metadata nbgrader would refuse (a newer
# schema, a pasted copy of a cell, unknown ids, wrong types) is stripped from that cell before nbgrader sees it:
# one student's notebook can neither exhaust the grader's memory nor stop the run for everyone after it.
c.Autograde.exporter_class = "dsgd_teach.grading.nbg.guard.BoundedExporter"
c.Autograde.autograde_preprocessors = [
    _ROUTE + "DsgdGrade",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    _ROUTE + "DsgdComments",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    _ROUTE + "RedactFeedback",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
c.DsgdGrade.timeout_s = 60  # seconds per cell
c.DsgdGrade.memory_mb = 1536  # per grading kernel
c.DsgdGrade.cpu_s = 600  # per grading kernel
# c.DsgdGrade.seed = 1234  # only to re-grade an earlier batch: its seed is in dsgd_grading_batches.jsonl
