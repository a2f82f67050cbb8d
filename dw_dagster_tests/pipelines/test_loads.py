"""The pipeline file of an incremental load: validated when read, hostile names refused."""

import pytest
import yaml

from dw_dagster.pipelines.incremental import IncrementalLoadSpec, LoadSpecError
from dw_dagster_tests.databases.test_source_postgres import SPEC


@pytest.mark.parametrize("change,message", [
    ({"target_table": "pos.x'; DROP TABLE pos.sales_line; --"}, "not a plain"),
    ({"target_table": 'x"\'; DELETE FROM pos'}, "not a plain"),
    ({"merge_key": "sales_line_idd"}, "merge_key 'sales_line_idd' must be one of the loaded columns"),
    ({"columns": ["sales_line_id", "store_id; --"]}, "not a plain column name"),
], ids=["hostile_dotted_table", "hostile_table", "merge_key_typo", "hostile_column"])
def test_pipeline_file_refuses_hostile_or_inconsistent_names(tmp_path, change, message):
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump({**SPEC, **change}))
    with pytest.raises(LoadSpecError, match=message):
        IncrementalLoadSpec.from_file(f)


def test_bad_yaml_names_the_file_and_line(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("source_table: pos.sales_line\ncolumns: [a, b\n")
    with pytest.raises(LoadSpecError, match=r"(?s)p.yaml:3: not valid YAML.*p.yaml, line 2"):
        IncrementalLoadSpec.from_file(f)
