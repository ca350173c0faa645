"""Statistics across seeds, failure flags and computed verdicts: the inference engine.

Pure functions over plain Python data; :mod:`fathom.study` turns run directories
into these inputs. The rules are written once in ``docs/statistics.md``: trained /
failed / undetermined (:mod:`~fathom.stats.chance`), paired comparisons with a resolution
floor, a smallest effect of interest, Holm and leave-one-seed-out
(:mod:`~fathom.stats.inference`), depth scaling answered as a level and a trend
(:mod:`~fathom.stats.scaling`), the
typed results model (:mod:`~fathom.stats.results`) and the claim checker
(:mod:`~fathom.stats.claims`).

Every name is exported lazily (:mod:`fathom.base.lazy`): a command that needs a run's
failure flags imports neither scipy nor the inference engine.
"""

from fathom.base.lazy import exports

__getattr__, __dir__, __all__ = exports(
    __name__,
    {
        "fathom.stats.chance": ["ChanceTest", "chance_test"],
        "fathom.stats.claims": ["check"],
        "fathom.stats.contrasts": ["Contrast", "contrast", "contrast_sentence"],
        "fathom.stats.flags": [
            "CHANCE_CE_TOLERANCE",
            "EXCLUDING_FLAGS",
            "NOT_FITTING_ACCURACY",
            "failure_flags",
            "is_excluded",
        ],
        "fathom.stats.inference": ["judge", "paired", "verdict_of"],
        "fathom.stats.intervals": ["Interval", "mean_sd", "paired_difference", "t_interval"],
        "fathom.stats.results": ["Claim", "Comparison", "Quantity", "Results", "Sentence"],
        "fathom.stats.rules": ["DEFAULT_RULES", "Rules"],
        "fathom.stats.scaling": ["depth_scaling_verdict"],
        "fathom.stats.scaling_table": ["ArmRuns", "DepthScalingTable", "DepthScalingVerdict"],
        "fathom.stats.summary": ["RunRecord", "summarise_study"],
        "fathom.stats.summary_md": ["to_markdown"],
        "fathom.stats.verdicts": ["RankComparison", "first_crossing", "rank_disagreement"],
    },
)
