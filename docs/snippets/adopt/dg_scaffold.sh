dg list components | grep dw_dagster          # dw_dagster.DataOpsComponent
dg scaffold defs dw_dagster.DataOpsComponent dataops   # writes defs/dataops/defs.yaml and domains.yaml
