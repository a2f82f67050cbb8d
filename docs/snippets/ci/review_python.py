from dw_dagster.lineage import review_manifests

review = review_manifests("base-target", "head-target", domains="domains.yaml")   # a pydantic Review
review.state_modified_plus, review.columns, review.sensitive, review.domains
if review.failures(["breaking", "sensitive"]):
    raise SystemExit(1)
