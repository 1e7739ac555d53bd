"""The grader's tests, one file per boundary of docs/grading-threat-model.md, and the per-exercise checks."""
