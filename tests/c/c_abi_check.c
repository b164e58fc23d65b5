/* ferry.h is a C header: this file compiles as strict C99 and links against libferry_c.so (ctest
 * c_abi_is_c). It makes and releases a host device and an analysis error, the C way. */
#include <stdio.h>
#include <string.h>

#include "ferry/c/ferry.h"

int main(void) {
  if (ferry_abi_version() != FERRY_C_ABI_VERSION) return 1;
  ferry_device* dev = NULL;
  if (ferry_device_create("host", 0, &dev) != FERRY_OK) return 2;
  ferry_stream* s = NULL;
  if (ferry_stream_create(dev, &s) != FERRY_OK ||
      ferry_stream_synchronize(dev, ferry_stream_handle(s)) != FERRY_OK)
    return 3;
  ferry_analysis* a = NULL;
  if (ferry_analyze_file("/nonexistent/trace.json", NULL, 0.1, 0, 0, &a) == FERRY_OK) return 4;
  if (strstr(ferry_last_error(), "/nonexistent/trace.json") == NULL) return 5;
  ferry_stream_destroy(s);
  ferry_device_destroy(dev);
  printf("ferry %s: C ABI %d ok\n", ferry_version(), ferry_abi_version());
  return 0;
}
