#include "grad_check.h"
