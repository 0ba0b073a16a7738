"""Loading an uploaded `torch.export` file (.pt2) without evaluating anything from it.

    ep = load_exported_program(path_bytes_or_file, max_bytes=..., max_unpacked_bytes=..., max_ratio=...)

`torch.export.load` trusts its file. This loader is a second line behind the confined child process it runs in
(docs/DESIGN.md, "Untrusted input"): every string of `models/model.json` belongs to a class, each class is an
allowlist of what is safe by construction where torch puts it, and anything else is refused, naming the string
and where it is. Reading torch 2.13's loader (`torch/export/pt2_archive/_package.py`,
`torch/_export/serde/serialize.py`, `torch/utils/_pytree.py`, `torch/export/_unlift.py`, `torch/fx/graph.py`),
the strings go to these places:

- Python names (an ASCII identifier not starting with "__"): node names (the deserializer sets `node.name`
  unsanitized; FX writes each as a variable), tensor and symbol names (`as_tensor.name`, `as_name`, the keys of
  `tensor_values` and `sym_*_values`), placeholder targets (written raw into `forward`), operator argument names,
  metadata keys, schema field names, and every string not listed below. Argument names
  (`forward_arg_names`: `def forward(self, <names>)`) and namedtuple field names must not be keywords either.
- Attribute paths (`parameter_name`, `buffer_name`, `tensor_constant_name`, module `fqn`s, the keys of the
  weights and constants configs): `_assign_attr` gives each dot-separated part to `setattr`, and FX writes a
  part that is not an identifier as `getattr(m, "part")` (`_format_target`). Each part is printable ASCII
  without quotes, backslashes or braces and does not start with "__": regnet's `block4-11` is accepted, a part
  that could close the literal is not. Module paths elsewhere (`nn_module_stack`) are metadata text.
- pytree specs (`in_spec`, `out_spec`; `treespec_loads`): only leaf, tuple, list, dict, OrderedDict and
  namedtuple nodes (enum contexts and `defaultdict` factories import modules by name). Tuple and list contexts
  are `null`; dict and OrderedDict contexts a list of one key per child, each a printable string, a number, a
  bool or null: data only (`tree_flatten_spec`, `tree_unflatten`), except the keys of the keyword-argument dict
  of an input spec `(args, kwargs)`, which FX pastes into the source of `ep.module()` (`'{key}':{arg}` in
  `_PyTreeCodeGen.gen_var_bindings`, and as parameter names in `_get_codegen`): those must be Python names and
  not keywords. A namedtuple context is its registered type name (printable); torch looks it up among the
  types registered in the loading process, so the loader renames it to a stand-in registered with the field
  names of `treespec_namedtuple_fields` (Python names, not keywords; `collections.namedtuple` validates them).
- floats (`as_float`, `as_floats`, `as_float_lists`, `real`, `imag`): JSON numbers, or exactly `Infinity`,
  `-Infinity` and `NaN`, which torch's serializer writes for inf, -inf and nan (`_dataclass_to_dict`) and
  `float()` reads back: a causal mask's `masked_fill(mask, float('-inf'))`. Nowhere else.
- string arguments (`as_string`, `as_strings`): values of the operator call (`reduce="mean"`), which FX writes
  with `repr`: any string up to 64 KiB.
- every `expr_str` (tensor sizes, strides and offsets, symbolic ints, floats and bools) goes to
  `sympy.sympify`, which `eval`s it: each must parse (`ast`, never evaluated) as a sympy `srepr` or infix
  expression of shape symbols (`s77`, `u0`), bounded integer literals, arithmetic and the integer functions
  torch prints (`Add`, `Mul`, `FloorDiv`, `Mod`, `Max`, `Eq`, ...; exponents and shifts by a literal <= 64);
- `guards_code` is compiled with `exec` when the program is unlifted with example inputs: each entry must be a
  comparison of `L['input'].size()[i]`, `.stride()[i]`, integers and arithmetic (subscript keys printable
  ASCII without quotes, backslashes or braces);
- `range_constraints` keys (symbol names, `int()`-parsed for unbacked symbols) follow the expression rule,
  with symbol numbers of at most 6 digits, and their bounds are 64-bit integers;
- node `target`s and `as_operator` arguments are resolved with `getattr` chains on `torch`, `operator` and
  `math` (`torch.os.system` resolves): each must be an `aten` overload (`torch.ops.aten.<op>.<overload>`) or
  one of torch's own symbolic-int operators; higher-order operators (subgraphs) and `#extension` operators
  are refused, and after loading every call must really be an `aten` `OpOverload` or one of those;
- node metadata is text (`stack_trace` becomes comments of FX's source: no carriage return or NUL);
  `source_fn_stack` targets are resolved with `getattr` on `torch` (dotted names); `custom` and `from_node`
  are JSON; device types are cpu, cuda or meta; verifiers ATEN or TRAINING;
- custom objects (torchbind `_pickle_load_obj`, opaque objects `pickle.loads`) and payloads marked
  `use_pickle` (`torch.load(weights_only=False)`) are refused, as are the legacy `.pt` weight files, AOTInductor
  folders (shared libraries) and anything else not written by `torch.export.save`;
- the sample inputs (`torch.load`, falling back to `weights_only=False`) are scanned with `pickletools`
  (opcodes only) and refused unless they rebuild plain tensors, and are then left out: torch gets none.

After loading, `check_graph` checks what torch built: aten calls only, plain tensors, Python-name node names
and placeholder targets, and keyword-argument keys of the input spec that are Python names.

Sizes: the file, the unpacked total (declared in the central directory, before inflating; `zipfile` never
inflates more than a member's declared size and checks its CRC) and the compression ratio of every member
over 1 MiB are bounded; a stored tensor's extent must fit its record. Finally torch loads a canonical
archive rebuilt from the checked members only (so torch's own zip reader cannot read something other than
what was checked), with `torch.load` forced to `weights_only=True` and `pickle.loads` refused.

The checks, one module a job: `rules` (the words: `ModelError`, the classes of strings), `expressions` (strings
torch evaluates), `program` (the program's JSON field by field), `payloads` (weights, constants, sample
inputs), `load` (the archive, torch's load, the loaded graph). This package re-exports what callers use.

Layering: imports nothing from `compiler`; torch is imported inside the functions that load or inspect a
program, so the API can name `ModelError` and the limits without it.
"""

from __future__ import annotations

from .expressions import check_guard, check_sym_expr, check_target, check_treespec
from .load import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_RATIO,
    DEFAULT_MAX_UNPACKED_BYTES,
    MAX_MEMBERS,
    RATIO_FLOOR,
    check_graph,
    load_exported_program,
    static_shapes,
)
from .payloads import MAX_PICKLE_BYTES, check_payload_config, check_sample_inputs
from .program import check_program
from .rules import MAX_EXPRESSION_CHARS, QUANTIZED_OPS, ModelError, short_error

__all__ = ["DEFAULT_MAX_FILE_BYTES", "DEFAULT_MAX_RATIO", "DEFAULT_MAX_UNPACKED_BYTES", "MAX_EXPRESSION_CHARS",
           "MAX_MEMBERS", "MAX_PICKLE_BYTES", "QUANTIZED_OPS", "RATIO_FLOOR", "ModelError", "check_graph",
           "check_guard", "check_payload_config", "check_program", "check_sample_inputs", "check_sym_expr",
           "check_target", "check_treespec", "load_exported_program", "short_error", "static_shapes"]
