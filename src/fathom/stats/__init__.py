"""Statistics across seeds, failure flags and computed verdicts: the inference engine.

Pure functions over plain Python data; :mod:`fathom.study` turns run directories
into these inputs. The rules are written once in ``docs/statistics.md``: trained /
failed / undetermined (:mod:`~fathom.stats.chance`), paired comparisons with a resolution
floor, a smallest effect of interest, Holm and leave-one-seed-out
(:mod:`~fathom.stats.inference`), depth scaling answered as a level and a trend
(:mod:`~fathom.stats.scaling`), the
typed results model (:mod:`~fathom.stats.results`) and the claim checker
(:mod:`~fathom.stats.claims`).
"""

from fathom.stats.chance import ChanceTest, chance_test
from fathom.stats.claims import check
from fathom.stats.contrasts import Contrast, contrast, contrast_sentence
from fathom.stats.flags import (
    CHANCE_CE_TOLERANCE,
    EXCLUDING_FLAGS,
    NOT_FITTING_ACCURACY,
    failure_flags,
    is_excluded,
)
from fathom.stats.inference import judge, paired, verdict_of
from fathom.stats.intervals import Interval, mean_sd, paired_difference, t_interval
from fathom.stats.results import Claim, Comparison, Quantity, Results, Sentence
from fathom.stats.rules import DEFAULT_RULES, Rules
from fathom.stats.scaling import depth_scaling_verdict
from fathom.stats.scaling_table import ArmRuns, DepthScalingTable, DepthScalingVerdict
from fathom.stats.summary import RunRecord, summarise_study
from fathom.stats.summary_md import to_markdown
from fathom.stats.verdicts import RankComparison, first_crossing, rank_disagreement

__all__ = [
    "CHANCE_CE_TOLERANCE",
    "DEFAULT_RULES",
    "EXCLUDING_FLAGS",
    "NOT_FITTING_ACCURACY",
    "ArmRuns",
    "ChanceTest",
    "Claim",
    "Comparison",
    "Contrast",
    "DepthScalingTable",
    "DepthScalingVerdict",
    "Interval",
    "Quantity",
    "RankComparison",
    "Results",
    "Rules",
    "RunRecord",
    "Sentence",
    "chance_test",
    "check",
    "contrast",
    "contrast_sentence",
    "depth_scaling_verdict",
    "failure_flags",
    "first_crossing",
    "is_excluded",
    "judge",
    "mean_sd",
    "paired",
    "paired_difference",
    "rank_disagreement",
    "summarise_study",
    "t_interval",
    "to_markdown",
    "verdict_of",
]
