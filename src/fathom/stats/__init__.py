"""Statistics across seeds, failure flags and computed verdicts.

Pure functions over plain Python data; :mod:`fathom.study` turns run directories
into these inputs.
"""
