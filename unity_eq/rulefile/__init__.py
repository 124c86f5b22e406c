"""Rule files (``.egg``): their terms, the signatures they may use, the parser with its load-time checks, and
loading them as `optimize` and `verify` both do.

==========  ==============================================================================================
module      what it holds
==========  ==============================================================================================
terms       the syntax tree of rules: ``App``, ``Var``, ``Lit``, ``Rule``, analysis declarations
env         signatures: the schema's constructors, the analyses' functions and relations, egglog primitives
parse       the parser (lark) and the load-time checks (commands, constructors, arity, sorts, rulesets)
load        the shipped files then the chosen ones, parsed and then loaded by egglog itself
==========  ==============================================================================================

The engine never needs the verifier: ``verify`` builds on this package, not the other way round.
"""
