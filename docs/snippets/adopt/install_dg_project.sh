pip install create-dagster
create-dagster project shop-data --no-uv-sync
cd shop-data
# create-dagster pins the newest dagster patch (dagster==1.13.N); dw-dagster needs dagster-dbt
# (and its review extra dagster-webserver) of that same release, which may not be out yet:
# keep the minor version and let the installer pick the patch they share
sed -i -E 's/"dagster==([0-9]+\.[0-9]+)\.[0-9]+"/"dagster~=\1.0"/' pyproject.toml
pip install -e . dw-dagster dagster-dg-cli
