# nbgrader configuration for the dsgd-teach assignments (run nbgrader from course/assignments/).
# `make assignments` does not need this file: it runs nbgrader in a temporary course directory.
# Keep the sources (with solutions and hidden tests) in a private fork; release/ is what students get.
c = get_config()  # noqa: F821 - provided by nbgrader when it loads this file

c.CourseDirectory.root = "."
c.CourseDirectory.source_directory = "source"
c.CourseDirectory.release_directory = "../../release"
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearHiddenTests.begin_test_delimeter = "BEGIN HIDDEN TESTS"
c.ClearHiddenTests.end_test_delimeter = "END HIDDEN TESTS"
c.Execute.timeout = 60
