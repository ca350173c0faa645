"""Statistics across seeds, failure flags and computed verdicts.

Pure functions over plain Python data; :mod:`fathom.study` turns run directories
into these inputs.
"""

from fathom.stats.contrasts import Contrast, contrast, contrast_sentence
from fathom.stats.flags import (
    CHANCE_CE_TOLERANCE,
    EXCLUDING_FLAGS,
    NOT_FITTING_ACCURACY,
    failure_flags,
    is_excluded,
)
from fathom.stats.intervals import Interval, mean_sd, paired_difference, t_interval
from fathom.stats.scaling import (
    ArmRuns,
    DepthScalingTable,
    DepthScalingVerdict,
    depth_scaling_verdict,
)
from fathom.stats.summary import RunRecord, summarise_study, to_markdown
from fathom.stats.verdicts import (
    RankComparison,
    Verdict,
    compare,
    first_crossing,
    rank_disagreement,
    verdict_sentence,
)

__all__ = [
    "CHANCE_CE_TOLERANCE",
    "EXCLUDING_FLAGS",
    "NOT_FITTING_ACCURACY",
    "ArmRuns",
    "Contrast",
    "DepthScalingTable",
    "DepthScalingVerdict",
    "Interval",
    "RankComparison",
    "RunRecord",
    "Verdict",
    "compare",
    "contrast",
    "contrast_sentence",
    "depth_scaling_verdict",
    "failure_flags",
    "first_crossing",
    "is_excluded",
    "mean_sd",
    "paired_difference",
    "rank_disagreement",
    "summarise_study",
    "t_interval",
    "to_markdown",
    "verdict_sentence",
]
