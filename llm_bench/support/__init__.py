"""Small helpers every layer uses, each for one idea: waiting with a deadline, fanning work out over
threads, formatting numbers, drawing a chart file. Nothing here knows about servers or results."""
