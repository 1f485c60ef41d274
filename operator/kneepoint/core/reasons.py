"""Every condition type, condition reason and event reason the operator writes.

Reasons are one CamelCase word (Kubernetes API conventions); keeping them in one module
lets users grep for what a status or event can say, and tests assert against constants.
"""

# Condition types. Conditions are observations, not a phase sequence.
ACCEPTED = "Accepted"
PLANNED = "Planned"
PROFILING = "Profiling"
DECIDED = "Decided"
FAILED = "Failed"
METRICS_AVAILABLE = "MetricsAvailable"
CONDITION_TYPES = (ACCEPTED, PLANNED, PROFILING, DECIDED, FAILED, METRICS_AVAILABLE)

# Condition and event reasons.
SPEC_VALID = "SpecValid"
SPEC_INVALID = "SpecInvalid"
PLAN_READY = "PlanReady"
PLAN_FAILED = "PlanFailed"
MISSING_OBJECT = "MissingObject"
NO_TIER_FITS = "NoTierFits"
TIER_SKIPPED_EVENT = "TierSkipped"  # the event; status.TIER_SKIPPED is the phase "Skipped"
WAITING_FOR_GPUS = "WaitingForGPUs"
TIER_DEPLOYING = "TierDeploying"
TIER_READY = "TierReady"
TIER_START_FAILED = "TierStartFailed"
TIER_OUT_OF_MEMORY = "TierOutOfMemory"
TIER_UNSCHEDULABLE = "TierUnschedulable"
LOAD_TEST_STARTED = "LoadTestStarted"
LOAD_TEST_FINISHED = "LoadTestFinished"
LOAD_TEST_RETRIED = "LoadTestRetried"
LOAD_TEST_FAILED = "LoadTestFailed"
METRICS_COLLECTED = "MetricsCollected"
METRICS_MISSING = "MetricsMissing"
ENGINE_NOT_SCRAPED = "EngineNotScraped"
ENGINE_SCRAPED = "EngineScraped"
PROMETHEUS_UNREACHABLE = "PrometheusUnreachable"
TIER_MEASURED = "TierMeasured"
SPLIT_NOT_EFFECTIVE = "ParallelSplitNotEffective"
LADDER_RUNNING = "LadderRunning"
LADDER_FINISHED = "LadderFinished"
BUDGET_EXHAUSTED = "BudgetExhausted"
DECISION_MADE = "DecisionMade"
PREDICTION_MADE = "PredictionMade"
PREDICTION_MISSED = "PredictionMissed"
DECISION_UPDATED = "DecisionUpdated"
NO_DECISION = "NoDecision"
SPEC_CHANGED = "SpecChanged"
