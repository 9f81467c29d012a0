#include <criterion/criterion.h>
#include <string.h>

#include "nanoamp/error.h"

Test(error, status_strings_come_from_one_list) {
    cr_assert_str_eq(na_status_str(NA_OK), "ok");
    cr_assert_str_eq(na_status_str(NA_ESHAPE), "shape mismatch");
    cr_assert_str_eq(na_status_str(12345), "unknown status");
}

Test(error, set_and_clear) {
    int s = na_set_error(NA_EDTYPE, "na_thing: dtype %s not supported", "u8");
    cr_assert_eq(s, NA_EDTYPE);
    cr_assert_eq(na_last_status(), NA_EDTYPE);
    cr_assert_str_eq(na_last_error(), "na_thing: dtype u8 not supported");
    na_clear_error();
    cr_assert_eq(na_last_status(), NA_OK);
    cr_assert_str_eq(na_last_error(), "");
}
