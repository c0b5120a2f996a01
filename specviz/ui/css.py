"""The page's own CSS, added to the theme's."""

# Touch screens have no hover: a tapped token (focusable) shows its details below it.
CSS = """
.sv-tokens [data-tip] { position: relative; cursor: pointer; }
.sv-tokens [data-tip]:focus { outline: 2px solid #333; }
.sv-tokens [data-tip]:focus::after {
  content: attr(data-tip); position: absolute; left: 0; top: 1.7em; z-index: 20; white-space: pre;
  background: #111; color: #fff; font-size: 12px; line-height: 1.4; padding: 6px 8px; border-radius: 4px;
}
"""
