"""Our compiler: workloads, layouts and builds on TVM.

Importing it lets TVM's CPU runtime use every core (`target.use_all_cores`): TVM's own
default runs one thread per two x86 cores.
"""

from .target import use_all_cores

use_all_cores()
