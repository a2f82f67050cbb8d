make demo    # creates .venv, installs the project, runs the store-sales incident end to end
make test    # installs what the tests need and runs them (what CI runs: .ci/run)
