"""One evaluation job: models loaded and placed, run directories claimed, questions answered, summary written."""
