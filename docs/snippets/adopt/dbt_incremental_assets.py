import dagster as dg
from dagster_dbt import DbtCliResource, DbtProject, dbt_assets
from dw_dagster import DatabaseResource, dbt_incremental_build

project = DbtProject(project_dir="dbt_project")


@dbt_assets(manifest=project.manifest_path, project=project)
def shop_dbt(context: dg.AssetExecutionContext, dbt: DbtCliResource, warehouse: DatabaseResource):
    yield from dbt_incremental_build(context, dbt, database=warehouse.get_database(),
                                     arrival_columns={"fct_sales": "posted_ts"})
