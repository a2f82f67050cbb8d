dagster job execute -f ci_defs.py -j ci_checks    # exit 1 when a blocking check fails (or a check errors)
