#include "textflag.h"

// func storeRelease(addr *uint32, v uint32)
//
// x86 stores already have release semantics (TSO): a plain MOV orders
// every earlier store before this one, without the full fence of the XCHG
// that atomic.StoreUint32 compiles to.
TEXT ·storeRelease(SB), NOSPLIT, $0-12
	MOVQ addr+0(FP), AX
	MOVL v+8(FP), BX
	MOVL BX, 0(AX)
	RET
