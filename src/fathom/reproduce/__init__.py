"""Reproduce the seeds end to end: reference data, the pipeline and the comparison report."""
