"""Rule files (``.egg``): their terms, the signatures they may use, the parser with its load-time checks, and
loading them as `optimize` and `verify` both do.

==========  ==============================================================================================
module      what it holds
==========  ==============================================================================================
terms       the syntax tree of rules: ``App``, ``Var``, ``Lit``, ``Rule``, analysis declarations
env         signatures: the schema's constructors, the analyses' functions and relations, egglog primitives
sexp        the grammar (lark): a file's text as s-expressions, syntax errors at file:line:column
commands    the allowed commands: declarations into the Env, rewrites and rules into the rule AST
checks      the load-time checks of a rule (constructors, arity, sorts, bound variables, rulesets)
parse       ``parse_program``: files through those three, every error one line in ``Program.errors``
load        the shipped files then the chosen ones, parsed and then loaded by egglog itself
manifest    where the shipped rule files are and which of them ``optimize`` loads, in order; reading them
certificate what each rule's proof covers (rules/proofs.json), applied as the files are read
==========  ==============================================================================================

The engine never needs the verifier: ``verify`` builds on this package, not the other way round.
"""
