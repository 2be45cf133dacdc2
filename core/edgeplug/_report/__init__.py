"""The lowering's report, in one package (importing it loads nothing):

- ``records``: ``LoweringReport`` and the records in it, as a table for people and JSON for tools,
  and the graph nodes the page draws;
- ``html``: the one-file HTML page (``edgeplug report --html``), with its script and style in ``page/``.
"""
