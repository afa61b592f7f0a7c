"""The search: knob domains (space), the exhaustive oracle, the CP-SAT model, the Pareto front and explanations.

DESIGN.md §3 and §5. `autopar.search.solve.solve` is the entry point (re-exported as `autopar.solve`). The rules
(`costmodels.rules`) and the scoring of one plan (`costmodels.scoring`) live below the search, in the cost model.
Nothing here imports ortools at module level: `cpsat.py` imports it inside the functions that build the model.
"""
