"""Models from strangers checked before anything is converted, each problem one line naming
it: the model and its graphs (``validate``), nodes and strings against what ONNX defines
(``validate_nodes``), stored tensors from their metadata (``validate_data``); and what a model
declares wrongly but can be read anyway, repaired: types and shapes that inference contradicts
(``declared``), nodes out of topological order (``order``).
"""
