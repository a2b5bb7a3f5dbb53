"""``python -m neurovec.engines.native_build``: build neurovec's C++ kernels now, ahead of the first
compile, and say where they are (see ``engines/native.py``)."""
from neurovec.engines.native import main

if __name__ == "__main__":
    main()
