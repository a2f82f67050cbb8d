from dw_dagster.lineage import blast_radius, lineage_graph, select_nodes

g = lineage_graph(defs)  # or manifest_graph(json.load(open("target/manifest.json")))
br = blast_radius(g, select_nodes(g, "store_sales_line"))
print(br.models, br.assets, br.tests, br.exposures, br.owners)  # each item with depth, owners, URL
