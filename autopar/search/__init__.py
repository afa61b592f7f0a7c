"""The search: knob domains (space), named rules, the exhaustive oracle, the CP-SAT model and the Pareto front.

DESIGN.md §3 and §5. `autopar.search.solve.solve` is the entry point (re-exported as `autopar.solve`);
`autopar.search.rules.check_plan` names the rules one plan breaks (used by `autopar.estimate`).
Nothing here imports ortools at module level: `cpsat.py` imports it inside the functions that build the model.
"""
