"""One run, orchestrated (see README.md): ``raygen.run.driver.run`` checks, plans, runs the passes on Ray and
merges; the rest of this package are its phases' parts."""
