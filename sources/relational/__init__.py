"""Relational templates grounded natively: NeuraLogic-style rules -> whole-array joins -> a neurovec Graph.

    from neurovec.relational import R, V, C, Template, Relation, Metadata, Aggregation, Transformation

    template = Template()
    template += R.h(V.X)[3, 4] <= (R.feature(V.Y), R.edge(V.Y, V.X))
    template += R.h / 1 | Metadata(transformation=Transformation.TANH)
    template += R.predict[1, 3] <= R.h(V.X)
    graph = template.ground({"feature": Relation(nodes, values=x, example=graph_of_node),
                             "edge": Relation((src, dst), example=graph_of_edge)}, queries=R.predict)

The syntax is PyNeuraLogic 0.9.2's, the semantics NeuraLogic's; the docstrings of ``template``,
``grounding`` and ``assembly`` say how rules become joins and joins become layers.
"""
from .data import Query, Relation
from .grounding import Grounding, ground
from .sql import Database, SQLRelation
from .template import (C, F, R, V, Aggregation, Combination, Constant, Literal, Metadata, Offset, Rule, Template,
                       TemplateError, Transformation, Variable)

__all__ = [
    "Aggregation", "C", "Combination", "Constant", "Database", "F", "Grounding", "Literal", "Metadata", "Offset",
    "Query", "R", "Relation", "Rule", "SQLRelation", "Template", "TemplateError", "Transformation", "V",
    "Variable", "ground",
]
