"""Registry test module: a covered stage whose eligibility names a column items do not have."""

from tasks import CoverageItem, CoveredStage, define_task


def _noop(ctx: object, params: object) -> None:
    return None


bad_sql = define_task(
    id="bad-sql-task",
    resource_class="io",
    execute=_noop,
    input_model=CoverageItem,
    covers_stages=[
        CoveredStage(id="bad-sql", applies_to=("movie",), eligible_sql="mi.no_such_column > 1")
    ],
)
