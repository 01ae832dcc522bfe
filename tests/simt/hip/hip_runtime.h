// The emulator's stand-in for HIP's runtime header (tests/simt/simt_emu.h).
#pragma once
#include "../simt_emu.h"
