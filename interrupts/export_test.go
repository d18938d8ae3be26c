package interrupts

// DirectGraceForTest is DirectGrace, for the external tests.
const DirectGraceForTest = DirectGrace
