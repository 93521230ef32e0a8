#include "common/check.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(CheckDeathTest, FailingCheckPrintsConditionAndMessage) {
  int placeholders = -1;
  EXPECT_DEATH(TANDEM_CHECK(placeholders >= 0) << "underflow " << placeholders,
               "check failed: placeholders >= 0 underflow -1");
}

TEST(CheckTest, PassingCheckDoesNothing) {
  int evaluated = 0;
  TANDEM_CHECK(++evaluated == 1) << "message is not built";
  EXPECT_EQ(evaluated, 1);
}

}  // namespace
}  // namespace tandem
