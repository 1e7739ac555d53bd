"""Exercise graders: `report` (what they share) and one module per chapter's exercise."""
