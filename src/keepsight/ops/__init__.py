"""Sequence operators (pure torch): the multi-scale retention scan behind the LIA-MTR bridge."""

from keepsight.ops.naive import naive_multiscale_retention
from keepsight.ops.retention import check_lambdas, multiscale_retention, retention_step

__all__ = ["check_lambdas", "multiscale_retention", "naive_multiscale_retention", "retention_step"]
