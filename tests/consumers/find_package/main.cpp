#include "../consumer_main.inc"
