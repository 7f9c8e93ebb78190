"""SLO constraints: > 0 violated, <= 0 satisfied; an SLO that is not set (0) is satisfied."""

from __future__ import annotations

from tuner import (
    NO_DATA_VIOLATION,
    UNSET_SLO,
    Constraint,
    Measurements,
    ObjectiveContext,
    has_traffic,
    register_constraint,
    relative_violation,
)


@register_constraint
class SloP99E2E(Constraint):
    name = "slo_p99_e2e"
    description = "(P99 E2E - slo.p99_e2e_s) / slo.p99_e2e_s"

    def violation(self, m: Measurements, ctx: ObjectiveContext) -> float:
        return relative_violation(m.e2e.p99, ctx.slo.p99_e2e_s)


@register_constraint
class SloP99Ttft(Constraint):
    name = "slo_p99_ttft"
    description = "(P99 TTFT - slo.p99_ttft_s) / slo.p99_ttft_s"

    def violation(self, m: Measurements, ctx: ObjectiveContext) -> float:
        return relative_violation(m.ttft.p99, ctx.slo.p99_ttft_s)


@register_constraint
class SloP99Tpot(Constraint):
    name = "slo_p99_tpot"
    description = "(P99 TPOT - slo.p99_tpot_s) / slo.p99_tpot_s"

    def violation(self, m: Measurements, ctx: ObjectiveContext) -> float:
        if m.completed > 0 and m.tpot.n == 0:
            # Only 1-token outputs: no TPOT exists, so the SLO holds vacuously (as for goodput).
            return UNSET_SLO
        return relative_violation(m.tpot.p99, ctx.slo.p99_tpot_s)


@register_constraint
class ErrorRate(Constraint):
    name = "error_rate"
    description = "error_rate - slo.max_error_rate (0 = no failed request allowed)"

    def violation(self, m: Measurements, ctx: ObjectiveContext) -> float:
        if not has_traffic(m):
            return NO_DATA_VIOLATION  # an empty window is not an error-free one
        return m.error_rate - ctx.slo.max_error_rate


@register_constraint
class RejectedRate(Constraint):
    """Requests refused as too long for the server's context (a tier cap's max_model_len):
    not errors of the server, bounded on their own. At the default bound of 0 a cap that turns
    requests away is infeasible; a user who sends long requests to another tier allows a share."""

    name = "rejected_rate"
    description = "rejected_rate - slo.max_rejected_rate (0 = no rejected request allowed)"

    def violation(self, m: Measurements, ctx: ObjectiveContext) -> float:
        if not has_traffic(m):
            return NO_DATA_VIOLATION  # an empty window rejected nothing because it sent nothing
        return m.rejected_rate - ctx.slo.max_rejected_rate
