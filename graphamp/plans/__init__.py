"""Plans: the reviewed record of every decision (:class:`~graphamp.plans.plan.Plan`), the records
it is made of, the edit script a dialect applies, diffs, checks and explanations."""
