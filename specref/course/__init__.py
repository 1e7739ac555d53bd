"""The course machinery on top of the reference core: graders, plots, widgets and the doctor."""
