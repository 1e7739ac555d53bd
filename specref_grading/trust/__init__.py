"""The grader's trusted core: the code that holds the wall between the learner's code and the grade.

Read with docs/grading-threat-model.md. One concept a module:

* wire.py: the message format and its limits, checked on raw bytes before parsing;
* errors.py: the wall's own failures, and how an error crosses (a name and a message, never a type);
* values.py, records.py: what a value becomes on the other side (copies; handles for everything else);
* remote.py: the handle on an object of the other process;
* calls.py: the call machinery (`Peer`): requests, nested serving, sync-back of arrays and generators, caps;
* kernel_policy.py, trusted_policy.py: what each side exports, lets read and lets answer;
* exports.py: the declared wrappers, one per kind, in which the trusted side's objects leave it;
* program.py: the kernel's program, made of the kernel-side modules above;
* kernel_tree.py: the allow-list copy of specref the kernel imports;
* wall.py: starts the trusted process and the jailed kernel for a plan, reads the results' pipe;
* trusted.py: the trusted process, which runs the solution's setup and tests and decides each outcome;
* reading.py: the learner's notebook (its JSON, its answers' Python) parsed only in a limited process.
"""
