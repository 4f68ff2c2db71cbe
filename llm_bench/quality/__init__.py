"""Quality figures that carry their own uncertainty. Pure functions, no I/O.

``divergence``: how far a configuration's next-token distributions are from the reference's, over one
teacher-forced text (mean and 99th-percentile KL divergence, the share of positions with the same top
token), each with a block-bootstrap interval. ``exact_items``: exact-answer items generated from seeded
templates, and the checking of answers. ``paired``: the paired comparison of right/wrong answers with
McNemar's exact test and its verdict.
"""
