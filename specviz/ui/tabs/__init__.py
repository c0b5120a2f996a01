"""One handler module per tab or endpoint of the page."""
